"""A built corpus's files and format version (the directory layout of docs/data.md)."""

FORMAT = "catchat-corpus"
FORMAT_VERSION = 1
TOKENS_FILE = "tokens.bin"
INDEX_FILE = "index.npy"
MANIFEST_FILE = "manifest.json"
CORPUS_FILES = (TOKENS_FILE, INDEX_FILE, MANIFEST_FILE)  # what a build writes; the manifest last
