from tokencredit_trl.tiny import main

main()
