"""Federation: the adapter contract, request planning, running adapters under deadlines, fusion."""
