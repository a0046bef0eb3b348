"""The vocabulary of the index: how ids are minted, the states of documents and versions, and how reports name documents."""
