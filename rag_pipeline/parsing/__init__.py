"""Documents into per-page Markdown: file types, PDF text and tables, the layout tier, right-to-left text, forms, and the cascade that escalates only the pages that fail a structural check."""
