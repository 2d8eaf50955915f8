"""Core helpers every layer may use: canonical JSON and hashes, paths, packaged resources,
terminal-safe text, failpoints and the plugin registry. They import nothing else of Choir."""
