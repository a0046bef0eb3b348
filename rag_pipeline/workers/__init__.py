"""Long-lived worker processes that each work one document at a time within a wall-clock and memory budget."""
