from bench.bench import main

main()
