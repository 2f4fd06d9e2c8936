"""NNI's tuners driven in-process as an engine (no nnictl): ``engine`` and the tuners it adds (``tuners``)."""
