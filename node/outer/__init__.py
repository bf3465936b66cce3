"""The outer loop: the ledger service, the rounds and what comes between them, the base shift, update codecs
and outer files (see `node`)."""
