"""Getting models from a hub (Hugging Face, or whatever ``HF_ENDPOINT`` names): search,
memory-fit estimates from a ranged read of the GGUF header, resumable verified downloads
and the library of downloaded models. Qt-free; nothing here touches the network until a
function that says so is called (``catalog.search``, ``catalog.repo_files``,
``header.read_remote``, ``download.download``).
"""
