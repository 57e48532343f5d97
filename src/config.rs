//! Parameter-server configuration: HPS `ps.json`, parsed with JSON paths in every error.
