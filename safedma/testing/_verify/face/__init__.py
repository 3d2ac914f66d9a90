"""verify's face: the :func:`verify` function and the report it returns."""
