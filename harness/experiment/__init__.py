"""The experiment stage: the YAML spec (pydantic models, the sweep expanded into
cases), variants of a tunable implementation, and `new-op`'s skeleton writer."""
