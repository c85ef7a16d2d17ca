"""Drop-ins for the peers' launchers, on our runner: pyspark's ``TorchDistributor`` and
``DeepspeedTorchDistributor``, Databricks' ``@distributed``."""
