"""What the demo, the tests and the benchmarks start on this machine: the Tansu broker
(``broker``), a real Apache Kafka cluster (``kafka_cluster``, with ``kafka_install``,
``kafka_security`` and ``kafka_faults``) and the demo's producer and consumer (``workload``)."""
