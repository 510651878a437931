"""Where the state's output goes: the Prometheus exporter (``exporter``) and the alerts topic
(``alerts``); quarantined events go to files from ``streaming.job``."""
