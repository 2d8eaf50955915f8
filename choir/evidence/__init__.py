"""Evidence storage below the attestations: the content-addressed artifact store and the
hashed, sealed working-tree snapshots every verifier reads."""
