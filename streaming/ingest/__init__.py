"""From raw records to checked rows: the Spark schema of the contract (``schema``), decoding
(``parsing``) and the great-expectations quality gate (``quality``)."""
