"""Helpers the tests import: paths and command runners (cli), model comparisons (models),
hostile checkpoint builders (hostile_forge), planted porting bugs (planted), a mixture of
experts' output (experts) and directory pairs for verify-port (directories). Only models,
planted, experts and directories import a framework, and only where they are used."""
