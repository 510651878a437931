"""The client side: the probe (``monitor.probe``), instrumented clients (``monitor.instrument``)
and the event contract both emit (``monitor.contract``).  Nothing is imported here, so the job
reads the contract without loading the client wrapper."""
