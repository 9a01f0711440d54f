"""What a task reports: typed events for whoever supervises it, lines for people, usage errors."""
