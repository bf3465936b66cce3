"""Everything that exercises diloco at scale: local testnets, chaos, reports, baselines, and the
large-scale goodput simulator (:mod:`testnet.sim`)."""
