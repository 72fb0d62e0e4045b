"""Diagnoses (placeholder until written)."""


def diagnose(session, tspec, report, batches, runs) -> list:
    return []
