"""What only the command line uses: the database's administration (``db`` commands, the embedded
server, roles), archive and restore of a run, export and import of experience, the replica,
``reflexdb compare`` and the ``psql`` variables. The shared layer (``reflexdb/``) under the CLI;
nothing in the collector, the learner or a method imports it (tests/unit/test_layers.py)."""
