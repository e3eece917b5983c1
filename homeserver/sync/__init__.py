"""Long-poll /sync: the notifier, tokens, filters, account data, receipts and typing."""
