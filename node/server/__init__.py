"""The server: topology, launcher and supervision, the front's tables and config files, the write
service's encoders (docs/architecture.md)."""
