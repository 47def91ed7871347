from tokencredit_trl.train import main  # python -m tokencredit_trl: the training script

main()
