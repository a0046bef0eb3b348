"""Domain vocabularies shipped with the package (retrieval.query.synonyms_file: builtin:NAME)."""
