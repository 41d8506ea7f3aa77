"""The chaos runner and the PySpark delivery audit."""
