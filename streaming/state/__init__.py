"""The ``applyInPandasWithState`` function (``function``) and the columnar table of a bucket's
quiet partitions (``table``)."""
