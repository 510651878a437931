from monitor.instrument import instrument  # noqa: F401

__all__ = ["instrument"]
