"""The outer loop: the ledger service, the rounds, the base shift, update codecs and outer files (see `node`)."""
