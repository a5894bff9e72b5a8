"""Work off the UI thread: the engine process's event reader (engine_client.py), reads
of the chat database in proportion to a conversation (chat_reader.py), and the lexers
compiled ahead (lexer_warmup.py)."""
