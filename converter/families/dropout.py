"""Dropout layers: no weights; in eval both are the identity. They pair with each other by
kind, so that one left active is found at its own place."""

from . import Family, register

register(Family("dropout", ("Dropout", "Dropout1d", "Dropout2d", "Dropout3d", "AlphaDropout"),
                ("Dropout", "Dropout2D", "Dropout3D", "AlphaDropout"), kind="dropout"))
