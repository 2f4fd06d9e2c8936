"""Whole-model studies: tuned Relax models, fresh-process timings, per-operator profiles."""
