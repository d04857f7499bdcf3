"""Config and state files: the TOML loader, the shared schema, roster files, status files. No ZeroMQ: the
simulator imports it."""
