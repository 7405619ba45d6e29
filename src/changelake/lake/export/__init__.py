"""Lake tables exported to the table formats other engines read (Iceberg: `iceberg.py`)."""
