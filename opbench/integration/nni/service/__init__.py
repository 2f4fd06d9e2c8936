"""The local measurement service: warm build and run workers, the host timing lock and the record
sinks, kept alive across the short-lived processes NNI starts per trial.

It is a ``multiprocessing.managers`` server on a Unix socket private to the user and the MLflow store
(:mod:`opbench.integration.nni.service.address`); the first trial that needs it starts it (:mod:`opbench.integration.nni.service.client`),
later ones find it again, and it exits after an idle timeout (:mod:`opbench.integration.nni.service.server`).
"""
