"""Changefeeds on Spark in the JVM, one module per step (see `pipeline.py`)."""
