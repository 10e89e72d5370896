"""What comes in: SGLang's log (parsing, reading, following), its /metrics and its server info.
Pure parsers; I/O only in the readers and clients."""
