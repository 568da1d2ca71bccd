from ngcx.main import main

main()
