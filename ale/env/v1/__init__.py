"""Generated protocol code for ale.env.v1 (from proto/ale/env/v1/env.proto; `make proto`)."""
