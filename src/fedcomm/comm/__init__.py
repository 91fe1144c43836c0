"""Measured communication: payloads, the one bit-cost module, codecs and the ledger."""
