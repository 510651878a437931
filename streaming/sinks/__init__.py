"""Where the state's output goes: the Prometheus exporter (``exporter``; its metric catalogue in
``catalogue``, its ``/metrics`` server in ``http``) and the alerts topic (``alerts``); quarantined
events go to files from ``streaming.job``."""
