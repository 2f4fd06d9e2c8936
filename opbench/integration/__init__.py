"""What other tools run: ``nni/`` is everything ``nnictl`` starts (kept free of heavy imports)."""
