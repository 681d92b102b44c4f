"""The built-in Confluent-compatible schema registry (docs/schema-registry.md)."""
