"""Reading the events topic: the job's own Python data source (``source``) and Spark's
built-in kafka source as an alternative (``spark_kafka``)."""
