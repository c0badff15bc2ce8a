"""Detection power: the seeded-bug catalog (catalog), each mutant a correct backend with one real bug,
hunted with the conformance suite's own checks under every numerical structure."""
