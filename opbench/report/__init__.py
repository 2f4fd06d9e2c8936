"""What people look at: plots, tables and progress lines, and the report of a study."""
