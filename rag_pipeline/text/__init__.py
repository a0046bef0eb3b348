"""From parsed pages to chunks: cleaning, the lexical language, structure-aware chunking, contextual prefixes, near-duplicates and injection flags."""
