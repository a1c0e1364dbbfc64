"""The gym-over-gRPC protocol package ale.env.v1."""
