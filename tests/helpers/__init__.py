"""Helpers the tests import: paths and command runners (cli), model comparisons (models),
hostile checkpoint builders (hostile_forge), planted porting bugs (planted) and a mixture of
experts' output (experts). Only models, planted and experts import a framework, and only where
they are used."""
