"""Whole models as operator sources: model definitions, import into Relax, fusion, and the fused-operator cache."""
