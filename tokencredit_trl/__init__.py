"""tokencredit's loss, dynamic sampling and CSCR inside TRL's GRPOTrainer: trl_tokencredit.py."""
