"""Helpers the tests import: paths and command runners (cli), model comparisons (models),
hostile checkpoint builders (hostile_forge) and planted porting bugs (planted). Only models
and planted import a framework, and only where they are used."""
