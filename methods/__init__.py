"""Methods, one package each (``reflexdb.methods.<name>``): a method's workflow, loss terms and
families, config section, and (with a migration branch of its own) its schema objects, in one
folder. A package stands on the collector and the trainer (``tests/unit/test_layers.py``); reflexdb
finds each through its ``reflexdb.plugins`` entry point, as it finds a plug-in's
(``examples/plugins/selfcheck``). Nothing in reflexdb imports a method's package.
"""
