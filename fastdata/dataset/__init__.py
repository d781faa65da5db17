"""A dataset as data: the version record (its parts, each part's selection,
the columns joined to it, its classes), the resolver that opens a path as
one, and the commit that changes it; no torch."""
