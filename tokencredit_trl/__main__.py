from trl_bridge.trl_tokencredit import main

main()
