"""Per-layer backward (placeholder until written)."""


def local_rows(session, tspec, batch) -> list:
    return []
